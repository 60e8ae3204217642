"""The simulated core workload machinery: the Job controller, the scheduler, the kubelet and a
pod's processes, environment and DNS."""
