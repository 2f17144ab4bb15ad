"""The configuration: its schemas, the validated and typed settings, the scene sheet, and which
keys change each stage's result."""
