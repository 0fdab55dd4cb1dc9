//! The compiled-in local plugins: emptyDir, hostPath and local persistent volumes, on real mounts.
