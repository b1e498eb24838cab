"""Constants shared by the real-vLLM fixtures and tests."""

TOKEN = "real"
AUTH = {"authorization": f"Bearer {TOKEN}"}
NUM_BLOCKS = 64  # x 128 tokens: small enough that a handful of long prompts evicts
