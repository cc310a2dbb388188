"""Replaying recorded traffic through a policy's layers: the engine, each layer's counting
model, the report and a change's impact, suggested rates."""
