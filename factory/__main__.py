import sys

from ai_factory.factory.cli import main

sys.exit(main())
