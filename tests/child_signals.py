"""For tests that interrupt a child process with SIGINT, as a user's Ctrl-C would."""

import signal


def default_sigint():
    """``preexec_fn`` giving the child SIGINT's default action: a shell starts background jobs with
    SIGINT ignored and children inherit that (a CI run started with ``&``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
