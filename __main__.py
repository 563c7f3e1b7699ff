"""Entry point of `pulumi up`: the program lives in ai_factory.factory.rendering.program."""

from ai_factory.factory.rendering.program import main

main()
