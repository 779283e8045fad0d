from lakebroker.cli import main

main()
