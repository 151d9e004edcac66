"""The roles example's tools: a read and a write of a pretend ledger."""


def read_balance(account: str) -> str:
    """The balance of an account."""
    return f"{account}: 120 EUR"


def write_entry(account: str, amount_eur: int) -> str:
    """Book an amount on an account."""
    return f"booked {amount_eur} EUR on {account}"
