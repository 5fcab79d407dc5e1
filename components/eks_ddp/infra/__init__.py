"""Per-stack AWS infrastructure and the cluster add-ons it owns."""
