"""``python -m producer_outbox``: the ``kinbox outbox`` commands without the kinbox CLI."""

from producer_outbox.cli import outbox

if __name__ == "__main__":
    outbox(prog_name="kinbox outbox")
