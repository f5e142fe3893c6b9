"""The integration tests' fixtures (``stack``, ``make_topic``, ``schema``, ``db``) live in
tests/conftest.py, so the fault suite shares the same broker and server."""
