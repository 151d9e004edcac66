"""The approvals example's tool: it only says what it would do."""


def issue_refund(order: str, amount_eur: int) -> str:
    """Refund an order."""
    return f"refunded {amount_eur} EUR on order {order}"
