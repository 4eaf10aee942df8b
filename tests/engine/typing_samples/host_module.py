"""A host module as a Flask-SQLAlchemy shop writes it: checked with mypy --strict by
tests/engine/test_public_api.py (db.session is a scoped_session of its own Session class)."""

from __future__ import annotations

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import Mapped, mapped_column

from geneva_drive import Workflow, step

db = SQLAlchemy()


class Invoice(db.Model):  # type: ignore[name-defined,misc]
    id: Mapped[int] = mapped_column(primary_key=True)


class InvoiceWorkflow(Workflow):
    @step(wait_for="paid")
    def close(self) -> None: ...


def start(invoice: Invoice) -> InvoiceWorkflow:
    return InvoiceWorkflow.create(hero=invoice, session=db.session)


def existing(invoice: Invoice) -> list[InvoiceWorkflow]:
    return InvoiceWorkflow.for_hero(db.session, invoice)
