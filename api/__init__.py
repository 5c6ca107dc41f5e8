"""The catalog for everyone: a JSON API (read, and write behind a bearer token) and
server-rendered pages over the catalog. ``api.app.create_app`` builds the application and
``api.app.run_api`` serves it (``svfx api``)."""
