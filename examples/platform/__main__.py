"""`pulumi up` of a platform project of your own: the root component, built from this project's
stack file (`Pulumi.<stack>.yaml`, sections under `gpu-platform:`), planned from `plans/<stack>.json`
when it exists."""

from ai_factory.factory.rendering.program import main

main()
