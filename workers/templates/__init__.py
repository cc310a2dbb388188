"""Worker templates and JavaScript, shipped as package data of edgegen."""
