from tests.spark_fixtures import spark

__all__ = ["spark"]
