from offline_cli.main import main

main()
