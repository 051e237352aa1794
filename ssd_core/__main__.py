import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while torch imports: one line, not a traceback
    print("interrupted; nothing was written", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
