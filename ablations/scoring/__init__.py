"""How a model is scored on the dev set: perplexity, beam search and sacreBLEU (sections 6.1 and 6.2)."""
