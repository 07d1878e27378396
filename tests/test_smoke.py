import psycopg


def test_schema_installed(db: psycopg.Connection) -> None:
    row = db.execute("SELECT count(*) FROM dispatch.migrations").fetchone()
    assert row is not None and row[0] >= 4
