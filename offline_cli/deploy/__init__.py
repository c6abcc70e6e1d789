"""The core of `offline deploy` (DESIGN.md section 6): the steps every platform shares.

Modules: ``entry`` (find the server entry), ``templates`` (Dockerfile, .dockerignore, .gitignore),
``bundle`` (the shiv zipapp), ``client_build`` (the frontend), ``state`` (deploy.json), ``prompts`` and
``reporter`` (the terminal), ``build_context`` (all build steps at once, for image tests) and ``flow``
(deploy, status, logs, rollback, reset composed over a ``platform_adapters`` adapter). Nothing here is
imported by `offline --help`.
"""
