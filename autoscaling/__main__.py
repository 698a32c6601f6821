import sys

from autoscaling.cli import main

sys.exit(main())
