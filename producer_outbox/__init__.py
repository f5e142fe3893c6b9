"""kinbox: exactly-once database effects for Kafka consumers on PostgreSQL."""
