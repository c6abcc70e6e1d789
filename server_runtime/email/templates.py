"""Message templates: jinja2, one subject, one plain-text body and one HTML body per message.

A message named ``password-reset`` is made of ``password-reset.subject.txt``, ``password-reset.txt`` and
``password-reset.html``. ``EmailTemplates(directory)`` looks in the app's folder first, file by file, then in
the defaults shipped here (``server_runtime/email/templates``): an app overrides only what it wants to.
HTML templates are autoescaped; subjects are cut at the first line break.

The auth routes render ``password-reset`` and ``verify-email`` with ``email`` (the recipient), ``token``,
``link`` (``app_url`` + ``/reset-password?token=...`` or ``/verify-email?token=...``; None without an
``app_url``), ``app_url`` and ``expires_in_minutes``. An undefined name in a template is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from offline.core.errors import OfflineError

from .sender import EMAIL_CONFIG

if TYPE_CHECKING:
    import jinja2

__all__ = ["DEFAULT_TEMPLATES", "EmailTemplates", "RenderedEmail"]

#: The templates shipped with the server.
DEFAULT_TEMPLATES: Final = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True, slots=True)
class RenderedEmail:
    subject: str
    text: str
    html: str


class EmailTemplates:
    """Renders messages from the app's ``directory`` (optional) over the shipped defaults."""

    def __init__(self, directory: str | Path | None = None) -> None:
        folder = None if directory is None else Path(directory)
        if folder is not None and not folder.is_dir():
            raise OfflineError(
                f"email templates folder {str(folder)[:200]!r} does not exist; create it or remove the option",
                EMAIL_CONFIG,
                {"field": "email_templates"},
            )
        self.directory = folder
        self._env: tuple[jinja2.Environment, jinja2.Environment] | None = None

    def __repr__(self) -> str:
        return f"EmailTemplates(directory={None if self.directory is None else str(self.directory)!r})"

    def _environments(self) -> tuple[jinja2.Environment, jinja2.Environment]:
        if self._env is None:
            import jinja2  # loaded on the first message, not at server start

            folders = [str(p) for p in (self.directory, DEFAULT_TEMPLATES) if p is not None]

            def make(escape: bool) -> jinja2.Environment:
                return jinja2.Environment(
                    loader=jinja2.FileSystemLoader(folders),
                    autoescape=escape,
                    undefined=jinja2.StrictUndefined,
                    keep_trailing_newline=True,
                )

            self._env = (make(False), make(True))
        return self._env

    def render(self, name: str, context: Mapping[str, Any]) -> RenderedEmail:
        import jinja2

        plain, html = self._environments()
        try:
            subject = plain.get_template(f"{name}.subject.txt").render(context)
            text = plain.get_template(f"{name}.txt").render(context)
            body = html.get_template(f"{name}.html").render(context)
        except jinja2.TemplateError as exc:
            raise OfflineError(
                f"email template {name!r} could not be rendered: {type(exc).__name__}: {str(exc)[:200]}",
                EMAIL_CONFIG,
                {"field": "email_templates", "template": name},
            ) from None
        return RenderedEmail(subject.strip().splitlines()[0] if subject.strip() else name, text, body)
