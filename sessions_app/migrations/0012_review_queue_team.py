import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def attribute_queues(apps, schema_editor):
    """A queue made before queues had a team goes to the one team all its sessions are in,
    or (empty) to its creator's one team where they review; else it stays without a team,
    which only staff can open (and give a team in the admin)."""
    ReviewQueue = apps.get_model("sessions_app", "ReviewQueue")
    ReviewQueueItem = apps.get_model("sessions_app", "ReviewQueueItem")
    Membership = apps.get_model("sessions_app", "Membership")
    for queue in ReviewQueue.objects.filter(team__isnull=True):
        teams = set(ReviewQueueItem.objects.filter(queue=queue).values_list("session__team_id", flat=True))
        if not teams:
            teams = set(
                Membership.objects.filter(user_id=queue.created_by_id, role__in=("reviewer", "moderator")).values_list(
                    "team_id", flat=True
                )
            )
        if len(teams) == 1 and None not in teams:
            ReviewQueue.objects.filter(pk=queue.pk).update(team_id=teams.pop())


class Migration(migrations.Migration):

    dependencies = [
        ('sessions_app', '0011_run_claimed_seq'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='reviewqueue',
            name='team',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='review_queues', to='sessions_app.team'),
        ),
        migrations.AlterField(
            model_name='reviewqueue',
            name='name',
            field=models.CharField(max_length=100),
        ),
        migrations.AddConstraint(
            model_name='reviewqueue',
            constraint=models.UniqueConstraint(fields=('team', 'name'), name='reviewqueue_team_name_uniq'),
        ),
        migrations.RunPython(attribute_queues, migrations.RunPython.noop),
    ]
