"""The Airflow DAGs of the maintenance jobs (lakebroker_maintenance.py): `lakebroker spark paths` prints this
folder, for Airflow's dags_folder or to copy the file from."""
