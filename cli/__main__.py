from cli.main import main

if __name__ == "__main__":  # guarded: worker processes (spawn) import this module too
    main()
