"""The one error type of the budget: every bad input and every plan that does not fit raises it."""


class BudgetError(ValueError):
    """A one-line message naming the input (or the line of the sheet) at fault and what to change.

    A ValueError so that callers that already catch bad values catch this too; the CLI turns it
    into one line on stderr and exit code 2.
    """
