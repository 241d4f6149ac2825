"""A small error hierarchy. The CLI turns each into one line and exit code 2."""


def one_line(text: str) -> str:
    """The message on one line: control characters a user's input brought in (a newline in a
    name) are shown escaped."""
    return "".join(ch if ch >= " " or ch == "\t" else repr(ch)[1:-1] for ch in text)


class PipetteError(Exception):
    """Base class for every error a user can cause."""


class SpecError(PipetteError):
    """Invalid input: names where it came from, the field, and what to change.

    `str(err)` reads `<source>: <field>: <problem>`; `source` is a file path or a preset/option
    name, so the user can find what to fix.
    """

    def __init__(self, problem: str, *, source: str | None = None, field: str | None = None):
        self.problem = problem
        self.source = source
        self.field = field
        parts = [p for p in (source, field) if p]
        super().__init__(one_line(": ".join(parts + [problem])))


class ScheduleTooLongError(SpecError):
    """A plan whose schedule graph (micro-batches per replica x pipeline stages x chunks) is
    beyond what the cost model builds (model.plan.MAX_SCHEDULE_SLOTS); the search counts the
    shapes it leaves out for this reason and says so."""


class InfeasibleError(PipetteError):
    """No plan fits; the message says why and what would make one fit. `details`: the same
    facts as fields (the closest shape, the GPUs the model states need), which `--json` adds
    to its error object."""

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.details = details or {}


class SolverUnavailableError(PipetteError):
    """A solver backend (HiGHS) is missing or failed."""
