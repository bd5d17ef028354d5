"""The recipe's former entry point, kept working: ``fairseq-sparse-recipe`` (fairseq_sparse/recipe/) does it all."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fairseq_sparse.recipe.main import main  # noqa: E402

if __name__ == "__main__":
    main()
