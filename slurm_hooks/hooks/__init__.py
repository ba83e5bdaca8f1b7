"""What runs on a node: the health check, prolog, epilog and watcher, and their remediation."""
