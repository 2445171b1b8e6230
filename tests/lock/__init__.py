"""The lock algorithm against real nodes: Redlock, leases, reentry, fencing, wake, watchdog."""
