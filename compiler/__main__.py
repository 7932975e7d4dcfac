"""`rackc` and `python -m compiler`: ^C and SIGTERM are rackc's from its first line on, before
the command line module and its libraries are imported (compiler/interrupts.py)."""

import sys

from compiler import interrupts


def main() -> int:
    interrupts.install()
    try:
        from compiler.cli import main as run
    except KeyboardInterrupt as exc:  # while the CLI's modules were being imported
        sys.stderr.write("rackc: interrupted; nothing was written\n")
        return exc.exit_code if isinstance(exc, interrupts.Interrupted) else 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
