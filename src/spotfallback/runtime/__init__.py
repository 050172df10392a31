"""Ray shell: the trainer that drives Ray Train tier by tier, and the hooks that run inside its controller."""
