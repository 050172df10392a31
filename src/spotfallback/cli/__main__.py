from spotfallback.cli.app import main

main()
