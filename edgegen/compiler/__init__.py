"""Compiling a policy for the edge: rule expressions, the Worker, Terraform, stable ids, the
artifacts ``edgegen.build`` returns and writing them out."""
