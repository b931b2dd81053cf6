"""Task family ``chain_sum`` (in progress): verifiable-reward arithmetic from reasoning-gym. So far its
problems, scratchpad traces and exact-match verifier (:mod:`.problems`); the task is not registered in
``TASKS`` until its pipeline stages and evaluation land.
"""
