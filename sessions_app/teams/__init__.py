"""The team settings pages (/teams/, /teams/<name>/): members, agents, tools, rules,
notifications, budget and retention. Views call sessions_app.actions for every change
and every permission check."""
