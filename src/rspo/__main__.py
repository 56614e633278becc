from rspo.cli import main

main()
