try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line's modules import (its first ~0.3 s)
    import os
    import sys

    sys.stderr.write("attnviz: error: interrupted\n")
    sys.stderr.flush()
    os._exit(130)

main()
