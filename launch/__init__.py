"""From a plan to a running job: framework arguments, rank placement, pictures."""
