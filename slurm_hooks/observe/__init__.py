"""What is recorded and told: the audit log, its events and incidents, the Prometheus
textfile metrics and the notifications sent about incidents."""
