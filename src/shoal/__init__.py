"""Shoal: one GPU cluster manager for Slurm-style training and Kubernetes-style serving."""

__version__ = "0.1.0"
