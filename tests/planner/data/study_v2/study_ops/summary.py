def table(results):
    return {sid: r for sid, r in sorted(results.items())}
