from ai_factory.factory.cli import run

if __name__ == "__main__":  # not when a render's worker process imports the parent's main module
    run()
