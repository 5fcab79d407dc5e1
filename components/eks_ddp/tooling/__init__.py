"""Offline plan, mocks, preflight, cost: never imported by infra or workloads."""
