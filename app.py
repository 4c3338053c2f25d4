"""`python app.py` serves with waitress; `app` is the WSGI app for any other server.

Other servers do not migrate: run `leadsvc migrate` before starting them.
"""

from leadsvc import create_app

app = create_app()

if __name__ == "__main__":
    from leadsvc.cli import main

    main(["serve"])
