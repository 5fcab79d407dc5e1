"""The pure core: rules, catalog, CIDR math, scheduling, the agent command. No Pulumi."""
