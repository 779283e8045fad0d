"""The Kafka door: Kafka's protocol over the produce core (listener.py), its frames (wire.py) and
its record batches (record_batches.py)."""
