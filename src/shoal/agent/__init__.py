"""The node daemon: GPU discovery (NVML or a fake), host facts, labels, launch and supervision."""
