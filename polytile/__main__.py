import sys

from polytile.cli import main

sys.exit(main())
