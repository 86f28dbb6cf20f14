from objtrain.cli import main

main()
