"""The deploy's components, each a pyinfra `@deploy` function that adds the operations of one step.

`deploy.py` calls them in order for each host: `gpu_check`, `environments`, `models`, then per
service `service_account` and `service`, and `cleanup` last. pyinfra names each operation they
add `<Component> | <operation>` in its output. The operations themselves live in `operations/`.
"""
