from .recipe import main

main()
