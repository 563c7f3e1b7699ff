"""Entry point of `pulumi up`: the program lives in factory.program."""

from factory.program import main

main()
