"""Runnable examples of using lakebroker (the demo webhook receiver of docker-compose.yml)."""
