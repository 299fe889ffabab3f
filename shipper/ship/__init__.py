"""Batches -> Elasticsearch: the bulk protocol, the HTTP client, retries and the adaptive limit,
the index template. Never touches the spool: acks go back through the outbox."""
